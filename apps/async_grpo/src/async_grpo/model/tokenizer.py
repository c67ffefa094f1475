"""A small tokenizer trained locally on the task's own text, so nothing is downloaded.

The tiny preset needs a vocabulary a random-init model can explore: every extra token is one
more way to be wrong at the first step. So the tokenizer is word-level: its vocabulary is the
words and punctuation marks of the task corpus (plus `<pad>`, `<eos>`, `<unk>`), and decoding
joins tokens with spaces. Every token is a whole word, so a wrong token after a right number
never glues onto it ("1" + "co" -> "1co") and erases its credit; with sub-word pieces that
happens often enough to teach a random model to stop after its first word.

The result is wrapped as a `transformers` fast tokenizer and written with `save_pretrained`;
the app loads it back with `AutoTokenizer.from_pretrained`, the path a real checkpoint takes.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"

# The user's messages as they are, nothing around them: a preset that applies a chat
# template (qwen2.5-0.5b) also runs on a locally built checkpoint (`--model.random_weights`),
# whose word-level vocabulary has no role markers to put there.
PASS_THROUGH_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['content'] }}"
    "{% if not loop.last %}{{ '\n' }}{% endif %}{% endfor %}"
)


def build_tokenizer(corpus: Iterable[str], vocab_size: int = 4096) -> PreTrainedTokenizerFast:
    """Builds a word-level tokenizer from `corpus`, wrapped as a `PreTrainedTokenizerFast`.

    Keeps the `vocab_size` most frequent words; any other word maps to `<unk>`.
    """
    texts = list(corpus)
    if not texts:
        raise ValueError("build_tokenizer: the corpus is empty")
    tok = Tokenizer(models.WordLevel(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    # No token carries the "##" continuation mark, so this decoder puts a space between all.
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    trainer = trainers.WordLevelTrainer(
        vocab_size=vocab_size, special_tokens=[PAD, EOS, UNK], show_progress=False
    )
    tok.train_from_iterator(texts, trainer)
    fast: PreTrainedTokenizerFast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK
    )
    fast.chat_template = PASS_THROUGH_CHAT_TEMPLATE
    return fast


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, path: Path) -> None:
    """Writes the tokenizer files into `path` (created if missing)."""
    path.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(path))

"""Batched sampling with a KV cache, and the log-probs of the distribution actually sampled.

One function, `masked_logits`, defines the sampling distribution (temperature, top-p, the
tokenizer's vocabulary): the generator samples from it and records each token's log-prob;
the trainer recomputes log-probs through the same function. At equal weights the two agree,
so the importance ratio starts at exactly the value the math assumes (1 on-policy).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from async_grpo.config.schema import SamplingConfig
from async_grpo.grpo.logprobs import masked_logits


@dataclasses.dataclass(frozen=True)
class Completion:
    """One sampled response, as the generator hands it to the controller.

    `prompt` is the prompt text as requested (before any chat template); `text` the decoded
    response. `prompt_ids` [P] and `response_ids` [R] are token ids (the response includes
    the EOS token when the model produced one); `behavior_logprobs` [R] are the natural-log
    probabilities the sampling distribution gave each response token; `finished` is False
    when generation hit `max_new_tokens` first; `policy_version` is the weight version that
    produced it. Lists, not tensors: they cross a process boundary, and the controller turns
    them into the buffer's `Episode` tensors once (`episodes.to_episodes`).
    """

    prompt: str
    text: str
    prompt_ids: list[int]
    response_ids: list[int]
    behavior_logprobs: list[float]
    finished: bool
    policy_version: int


def chat_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str) -> str:
    """`prompt` as one user message, rendered by the tokenizer's chat template."""
    messages = [{"role": "user", "content": prompt}]
    return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))


@torch.no_grad()
def generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    cfg: SamplingConfig,
    policy_version: int,
    *,
    chat_template: bool = False,
    generator: torch.Generator | None = None,
    greedy: bool = False,
) -> list[list[Completion]]:
    """Samples `cfg.group_size` responses for each prompt in one batch (`sample`).

    `chat_template`: each prompt is sent as one user message through the tokenizer's chat
    template (the completions still record the prompt as given). Returns one list of
    `group_size` completions per prompt, in prompt order. `greedy`: as `sample`'s.
    """
    texts = [chat_prompt(tokenizer, p) for p in prompts] if chat_template else prompts
    encoded = [list(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    g = cfg.group_size
    completions = sample(
        model,
        tokenizer,
        encoded,
        cfg,
        policy_version,
        labels=prompts,
        generator=generator,
        greedy=greedy,
        repeats=g,
    )
    return [completions[k * g : (k + 1) * g] for k in range(len(prompts))]


@torch.no_grad()
def sample(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    rows: list[list[int]],
    cfg: SamplingConfig,
    policy_version: int,
    *,
    labels: list[str] | None = None,
    generator: torch.Generator | None = None,
    greedy: bool = False,
    repeats: int = 1,
) -> list[Completion]:
    """`repeats` responses for each row of token ids (a prompt, or a multi-turn context), all
    in one batch with a KV cache; `labels` are the rows' prompts as text (for the record; ""
    without).

    The model computes each distinct prefix once: a row's `repeats` responses share its
    prefill, and while two responses of a row have sampled the same tokens so far they share
    one cache row and one forward pass (`_split`); each response still draws its own token
    from that shared distribution. A GRPO group of 16 answers to one prompt starts as one
    row, not 16, and a policy that has learned its answer keeps few rows apart. A response
    that ended (EOS) leaves the batch. Rows are left-padded so every row's next token sits in
    the last column; position ids count only real tokens, so the trainer's right-padded
    recomputation sees the same positions. Returns the completions in row order, a row's
    `repeats` together. `greedy`: each token is the most likely one instead of a sample
    (`async-grpo eval --greedy`; training never is), its log-prob still that of the sampling
    distribution.
    """
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    if eos is None or pad is None:
        raise ValueError("the tokenizer needs an EOS and a pad token")
    if not rows or not all(rows):
        raise ValueError("sample needs at least one row, and no empty row")
    if repeats < 1:
        raise ValueError(f"sample: repeats must be at least 1, got {repeats}")
    vocab = len(tokenizer)
    width = max(len(r) for r in rows)
    device = next(model.parameters()).device
    input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=device)
    attention = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    logits = _next_logits(model, input_ids, attention, positions, cache)
    position = positions[:, -1:]
    n, steps = len(rows) * repeats, cfg.max_new_tokens
    tokens = torch.full((n, steps), pad, dtype=torch.long, device=device)
    logprobs = torch.zeros((n, steps), device=device)
    going = torch.arange(n, device=device)  # the responses in the batch, by output row
    # The cache row (prefix) each going response continues; a row's repeats share it.
    prefix = torch.arange(len(rows), device=device).repeat_interleave(repeats)
    for t in range(steps):
        dist = masked_logits(logits, cfg.temperature, cfg.top_p, vocab)
        logp = torch.log_softmax(dist, dim=-1)[prefix]
        if greedy:
            token = logp.argmax(-1)
        else:
            token = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
        tokens[going, t] = token
        logprobs[going, t] = logp.gather(-1, token.unsqueeze(-1)).squeeze(-1)
        open_ = token != eos
        if t == steps - 1 or not bool(open_.any()):
            break
        going, token, prefix = going[open_], token[open_], prefix[open_]
        kept, token, prefix = _split(prefix, token, dist.shape)
        if kept is not None:
            cache.batch_select_indices(kept)
            attention, position = attention[kept], position[kept]
        position = position + 1
        ones = torch.ones(len(token), 1, dtype=attention.dtype, device=device)
        attention = torch.cat([attention, ones], dim=-1)
        logits = _next_logits(model, token.unsqueeze(-1), attention, position, cache)
    token_rows, logprob_rows = tokens.tolist(), logprobs.tolist()
    completions: list[Completion] = []
    texts: dict[tuple[int, ...], str] = {}  # a group's answers repeat once it has learned one
    for i in range(n):
        row, out = rows[i // repeats], token_rows[i]
        finished = eos in out
        length = out.index(eos) + 1 if finished else steps
        response = out[:length]
        words = tuple(response[:-1] if finished else response)
        if words not in texts:
            # Other special tokens stay visible: a sampled <unk> or <pad> is a wrong word,
            # not a silently dropped one.
            texts[words] = str(tokenizer.decode(list(words)))
        completions.append(
            Completion(
                prompt=labels[i // repeats] if labels is not None else "",
                text=texts[words],
                prompt_ids=list(row),
                response_ids=response,
                behavior_logprobs=logprob_rows[i][:length],
                finished=finished,
                policy_version=policy_version,
            )
        )
    return completions


def _split(
    prefix: Tensor, token: Tensor, shape: torch.Size
) -> tuple[Tensor | None, Tensor, Tensor]:
    """The prefixes after each going response appended `token` [G] to its `prefix` [G] (one
    of the `shape` [prefixes, V] distribution's rows): responses that drew the same token from
    the same prefix still share one. Returns the cache rows the new prefixes extend, one per
    new prefix (None when that is every row once, in order: the cache stays as it is), the
    token each new prefix adds, and each response's new prefix."""
    prefixes, vocab = shape
    unique, inverse = torch.unique(prefix * vocab + token, return_inverse=True)
    kept = unique // vocab
    if len(kept) == prefixes and bool((kept == torch.arange(prefixes, device=kept.device)).all()):
        return None, unique % vocab, inverse
    return kept, unique % vocab, inverse


def _next_logits(
    model: PreTrainedModel,
    input_ids: Tensor,
    attention: Tensor,
    positions: Tensor,
    cache: DynamicCache,
) -> Tensor:
    """[B, V] logits of the token after `input_ids` [B, S], the cache extended by them."""
    out = model(
        input_ids=input_ids,
        attention_mask=attention,
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
    )
    logits: Tensor = out.logits[:, -1, :]
    return logits

"""The word games' vocabulary: short, common, lower-case English nouns."""

WORDS: tuple[str, ...] = (
    "apple", "river", "stone", "cloud", "tiger", "piano", "candle", "garden",
    "window", "rocket", "pencil", "forest", "bridge", "planet", "orange", "castle",
    "dragon", "mirror", "basket", "island", "ladder", "winter", "summer", "turtle",
    "banana", "button", "camera", "doctor", "engine", "finger", "guitar", "hammer",
    "jacket", "kettle", "lemon", "magnet", "needle", "ocean", "pepper", "rabbit",
    "saddle", "teapot", "violin", "wallet", "yogurt", "zipper", "anchor", "feather",
)  # fmt: skip

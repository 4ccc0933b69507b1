"""Output-length ranker (StreamRL §5): predicts which prompts will generate long outputs.

Not built yet; the skewness-aware generation issue fills this package."""

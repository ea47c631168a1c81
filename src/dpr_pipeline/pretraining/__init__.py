"""Pre-training the encoder on the target corpus: SimLM (the default) and the methods it is compared with."""

"""Models: loading any encoder, the bi-encoder's text embedding, model references, Hub fetching, cards and devices."""

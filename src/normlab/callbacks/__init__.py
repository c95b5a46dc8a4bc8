"""normlab.callbacks."""

"""normlab."""

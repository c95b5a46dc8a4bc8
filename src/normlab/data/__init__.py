"""normlab.data."""

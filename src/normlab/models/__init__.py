"""normlab.models."""

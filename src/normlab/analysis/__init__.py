"""normlab.analysis."""

"""normlab.tasks."""

"""`python -m qkstudy bench`: every backend's training step, measured the same way."""

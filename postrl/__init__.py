"""postrl: reinforcement-learning post-training of language models on verifiable tasks."""

__version__ = "0.1.0"

"""Training: the config, the built-in models, the :class:`Trainer` loop over the
loader, and checkpoints."""

"""Session languages besides Python: what the daemon knows of their code (the bash kernel's
commands, read before a call runs)."""

"""Resuming: backups written during fit (backup), restored and verified
before use (restore), atomic verified checkpoint files (checkpoints) and
the saves a preempting signal asks for (preemption)."""

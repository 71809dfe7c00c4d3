"""Child programs of the tools: each runs in a fresh process (so that XLA
flags apply from backend start) and prints one JSON line on stdout."""

"""Model definitions (Gemma 3n) and checkpoint loading."""

"""specgate's OpenAI-compatible front door: auth -> tenant -> policy -> replica -> streaming proxy."""

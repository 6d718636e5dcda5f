"""Capture of target hidden states for drafter training: the bounded sample
store (store.py: a tmpfs directory; mooncake_store.py and mooncake_runtime.py:
Mooncake Store; backends.py: which one a name means), the vLLM hidden-states
connector that fills it (connector.py, imported only inside vLLM) and the
capture replica's vLLM arguments (replica.py, pure). See contract/capture.py
for the sample format."""

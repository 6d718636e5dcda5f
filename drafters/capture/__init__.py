"""Capture of target hidden states for drafter training: the bounded sample
store (store.py) and the vLLM hidden-states connector that fills it
(connector.py). See contract/capture.py for the sample format."""

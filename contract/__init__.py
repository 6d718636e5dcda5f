"""What the gateway (data plane) and the controller (control plane) agree on.

Both planes import this package; it imports neither (tests/test_architecture.py).
Modules are imported one by one (`contract.knobs`, `contract.policy`, ...)
and this file imports nothing, because the vLLM plugin loads
`contract.knobs` inside vLLM's own environment, which has none of the
gateway's dependencies.
"""

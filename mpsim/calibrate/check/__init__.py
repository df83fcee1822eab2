"""Checking: mpsim's predictions against what the device measured.

``measured`` reads the steps a real PyTorch pipeline ran; ``compare`` fits the in-job
speed and per-action overhead on one schedule and checks the others; ``tp_predict``
predicts the DTensor tensor-parallel check; ``report`` and ``plot`` show the result.
"""

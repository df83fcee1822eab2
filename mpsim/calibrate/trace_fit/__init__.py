"""Fitting a calibration profile to the kernels of PyTorch profiler traces.

A trace of a real training step times every kernel the GPU ran; for GEMMs and
collectives it also gives what the model needs to price them (shapes, message sizes).
This package turns those kernels into a profile (``mpsim calibrate --from-trace``):

* ``samples``: the priceable kernels of a trace, and counts of what was skipped;
* ``split``: the held-out half, chosen by shape;
* ``robust``: the one fitting routine (robust, relative, non-negative);
* ``gemm``, ``comms``, ``memory``: the datasheet price and the fitted form of GEMMs,
  collectives and memory-bound kernels, and the gaps between kernels;
* ``build``: the profile, with its error on held-out kernels before and after fitting.

Reading traces is ``mpsim.traces``; the command is ``mpsim/calibrate/from_trace.py``.
"""

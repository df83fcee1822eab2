"""Measuring: what runs under torch on the device, and how it is planned and started.

``jobs`` and ``ops`` decide what a job measures (the ops mpsim prices for a scenario, at
its shapes; the pipeline schedules to run) and write it as JSON; ``launch`` starts one
``python -m mpsim.calibrate.measure.worker`` process per rank and collects what they
wrote. ``machine`` and ``guard`` describe the machine and tell whether it is quiet enough
to measure.

Everything else here runs inside those workers and needs torch: ``worker`` and
``phases`` (the order of the measurements), ``timing`` (clocks, repeat until stable),
``torch_model`` (the small transformer), ``opbench`` (one op at a time), ``commbench``
(point-to-point sends and collectives), ``pipeline`` (PyTorch's own pipeline
schedules), ``splitbench`` (what a split backward costs) and ``tp_check`` (DTensor
tensor parallelism). Nothing outside this subpackage imports those modules at import
time, so the rest of mpsim works without torch.
"""

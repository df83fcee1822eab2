"""Fitting: from the workers' raw measurements to a calibration profile.

``fitting`` holds the least-squares lines (numpy only); ``build`` merges the ranks'
measurements and fits the curves a profile carries. The profile's schema is input data
and lives with the other specs (``mpsim/specs/calibration.py``); the cost model applies
it (``mpsim/cost/calibrated.py``).
"""

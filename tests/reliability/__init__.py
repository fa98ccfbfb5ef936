"""The tool's own reliability checks, run as whole commands in subprocesses: the storm test of a
sweep under random faults (chaos.py) and the I/O-error and crash tests at every file operation
(faults.py, through fault_injection.py). `just chaos` and `just faults` run them."""

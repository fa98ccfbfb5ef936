"""Installs the fault injector (../fault_injection.py) in every Python process that starts with
this folder on PYTHONPATH and QKSTUDY_FAULT set: the harness's commands and the processes they
start (a sweep's workers), so the package itself holds no seam for it."""

import os

if os.environ.get("QKSTUDY_FAULT"):
    import importlib.util

    _path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                         "fault_injection.py")
    _spec = importlib.util.spec_from_file_location("qkstudy_fault_injection", _path)
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
    _module.install_from_env()

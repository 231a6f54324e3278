"""A script whose import fails (a module that does not exist), for the workbench's tests."""

import workbench_tests_no_such_module  # noqa: F401

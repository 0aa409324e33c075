from workbench.clean_exit import quiet_broken_pipe
from workbench.sweep.cli import main

if __name__ == "__main__":  # spawned workers import this module as __mp_main__; they must not rerun the sweep
    raise SystemExit(quiet_broken_pipe(main))

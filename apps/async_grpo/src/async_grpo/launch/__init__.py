"""Starting a run's processes: what is checked and built before anything starts
(`prepare`), where each component goes (`placement`), the hosts (`launchers`), and spawning
them (`spawn`, `trainer`); the process's stop signals, with their senders (`signals`).
"""

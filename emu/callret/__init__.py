"""Every call and ret the CPU executes (tracker.py) and the models that follow them: the CET shadow
stack (shstk.py), the return stack buffer (rsb.py), and their set-up for a checked run (models.py)."""

"""What agent code calls: the ``@agent`` definition, the run context, its patterns, gathers, steps
and callback tokens.
"""

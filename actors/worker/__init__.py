"""The host: the worker, its intake, activations, sticky runs, timers, interrupts, the schedule
loop, app loading and fault seams.
"""

"""The client side: starting, watching, listing and reporting on runs, and reading their output; it
imports nothing from the worker.
"""

"""What a run keeps beside its events: stored values, fold snapshots, continue-as-new chains and
runs still pending in the inbox.
"""

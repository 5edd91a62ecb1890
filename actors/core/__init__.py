"""The pure core: the fold, the journal, the replay machine, retry policies, membership and
schedule fire times; no I/O (no asyncio, no broker).
"""

"""An app module without agents: ``--app`` must say so."""

GREETING = "hello"

"""genready: ready means a real generation, served by the unit's current MainPID, succeeded."""

__version__ = "0.1.0"

"""A sweep's run: plan -> points -> strays -> start -> verify -> confirm -> warm and flush -> run -> record.

It writes the files the report reads (../files.py names them) and imports nothing of ../report/; the package
map is in ../__init__.py.
"""

"""`genready sweep report`: a sweep's files read back (../files.py, ../rows.py) and written as text, HTML or a
comparison. It imports nothing of ../run/; the package map is in ../__init__.py.
"""

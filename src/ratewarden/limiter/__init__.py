"""The limit arithmetic: counter ops, the Lua script and its pure-Python twin.

Below the stores: a store decides *where* counters live and makes the step atomic;
this package decides *what* a counter admits.
"""

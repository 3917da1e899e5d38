"""The generators of scripts/gen_book.py, by page (see its docstring)."""

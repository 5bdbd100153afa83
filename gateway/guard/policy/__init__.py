"""The rules file: its model, deciding a call, parsing, the file on disk, the read filter, its rendering."""

"""What a job leaves on disk: result records, the checkpoint, the final output files, and the
locks that make one run the only writer of an output.

Imports `io` for files and schemas; never the engine.
"""

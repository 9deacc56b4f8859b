"""What a job leaves on disk: result records, the checkpoint, the final output files, and the
locks that make one run the only writer of an output.

Imports `io` for files and schemas, the engine's result types (`engine.types`) and
`planning`'s rows; never the engine's model code, the executors or the job flow.
"""

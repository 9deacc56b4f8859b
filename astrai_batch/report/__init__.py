"""`astrai-batch report`: one finished job as an HTML page for a person (`page`), from its
output and stats file (`job_data`), plotted by matplotlib (`plots`, the `report` extra), with
the throughput history of `bench` result files (`bench_history`)."""

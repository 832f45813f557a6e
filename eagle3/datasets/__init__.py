"""The one dataset reader every stage shares: the manifest and the dataset files.

``manifest`` (the datasets YAML, relative sources, the DAG's Asset URIs), ``readers``
(files to records: JSONL, JSONL.gz, Parquet), ``records`` (what one record may hold:
formats, roles and aliases, reasoning keys, tools, content parts, and the reject
reasons), ``describe`` (untrusted values in messages). discover, regenerate, tokenize,
merge and the DAG read datasets only through these, so a dataset is accepted or refused
the same way everywhere. Nothing heavy is imported here.
"""

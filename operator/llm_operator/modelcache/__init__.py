"""The model cache: a source's files fetched once per (source, resolved revision) into a claim.

`python3 -m llm_operator.modelcache.fetch` (the fetch Job's program, run in the fetch image) writes
`models/<source key>/<resolved>/` on the claim; docs/architecture.md ("Artifacts and the serving
pod") has the layout. Standard library, boto3 and huggingface_hub only: the fetch image carries
this package and nothing else of ours.
"""

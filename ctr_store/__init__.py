"""Object storage: `s3://BUCKET/PREFIX` paths for the model repository, export's uploads and training's data.

One client configuration for every stage (`config.py`: the AWS tools' variables and TF Serving's `S3_*`), one
classification of the store's faults (`errors.py`), the few object calls the stages make (`objects.py`), and a
version's download and upload with its manifest (`versions.py`), pyarrow's S3 filesystem for training's data (`arrow.py`). docs/deploy.md says which paths may be `s3://`;
docs/decisions/0008-object-storage-client.md why boto3.
"""

"""Digests (``schema.schema_digest``) of the built-in tools' schemas under the default configuration,
checked against their metaschema by ``tests/test_schema.py`` rather than at every host start.

Generated: when a built-in schema changes, that test fails and prints the new set. A digest missing
here costs only time: the schema is then checked at mount like any other.
"""

from __future__ import annotations

from typing import Final

BUILTIN_SCHEMA_DIGESTS: Final[frozenset[str]] = frozenset({
    "03cf87040fae903901a23b3052cf2feb35e47bef62456acf1868b093a7ea7395",  # local::bash input_schema
    "2689825c88c2a9d228070f20c75732a6d1c458145154e87b67d738d3e602da88",  # local::bash output_schema
    "e740ff8f4444ad9a003a1e6e92d735717f205f23198bdb1dc3342200b0fd18a3",  # local::fs.edit_file input_schema
    "f5e29570bc39d2d9e535abfc9128f5dfaf4756980ff2eba6ae162f60983db227",  # local::fs.edit_file output_schema
    "779f6571a4b21a597cbd82ffaf15268da597f40c5d7b9c1c6c7b80d42e2fb868",  # local::fs.glob input_schema
    "c866c6d76931efae47bb7d43c782202ae53be2ab420128d8c451ba3b538ec121",  # local::fs.glob output_schema
    "47717a750875a945d0c9b7836f42270ab7e7cab3bf4ebc06bf77a465c4da148b",  # local::fs.grep input_schema
    "befb86062d2f93900ff0f04d589da83909e463aaa58d3beeb8c3b11c11fdf2ee",  # local::fs.grep output_schema
    "f1825c481a9c95e1d0dce846c58f79afabdeb90bf587c5173b053ea07110837b",  # local::fs.list_dir input_schema
    "3ae636e72f6a4a2b53564c91276a2087b607c7aecf96f3e6eae1a8bc68b00ca6",  # local::fs.list_dir output_schema
    "ed376f4b11f6338da7c117e17efb93c0d1858d710933c82cfd4566b365889521",  # local::fs.read_file input_schema
    "32102802784b5e810420f71d671a509a1d8e5515cdc26b5a0aa739b3a1a53778",  # local::fs.read_file output_schema
    "b7687d726f8db324b9e82ef77ca21b231140e4e816c27a3be61ac95850c616aa",  # local::fs.write_file input_schema
    "0637b38240743f2e55f939374bdc7b64cb1a829538ddaf84d75fe83204513569",  # local::fs.write_file output_schema
})

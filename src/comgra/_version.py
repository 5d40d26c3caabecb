"""The version of comgra, in a module of its own: the parts that write it into a recording or a document
read it here without importing the package's facade."""

__version__ = "1.0.0.dev0"

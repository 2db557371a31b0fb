"""The x402 protocol, independent of any web framework: wire shapes, codecs, SVM and SIWX."""

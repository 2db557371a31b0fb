"""Ways of paying: the seam they plug into (:mod:`gateway.methods.seam`) and one package per method."""

"""routes.yaml -> the route table: parsing, vocabulary, validation, pricing and the OpenAPI document."""

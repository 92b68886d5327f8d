"""What the tests share besides fixtures: clients, corpus access, fakes, servers under test
and the one timeout scale. Nothing here is a test."""

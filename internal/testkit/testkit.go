// Package testkit is what every test package of the module shares,
// whatever it tests: the one poll (Eventually, bounded by Patience). The
// /proc reader of the tests is its neighbour internal/proctest; the fakes
// are under internal/fake.
package testkit

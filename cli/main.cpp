// PLACEHOLDER: replaced by the flashgla command.
#include <cstdio>
#include "flashgla/flashgla.h"
int main() { std::printf("flashgla %s\n", flashgla::version()); return 0; }

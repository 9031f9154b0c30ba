# replbox warm pool: ruby. This interpreter was started ahead of time. It waits on stdin for
# one request, then runs the program the way `ruby main.rb ARGS` would.
-> do
  take = lambda do |n|
    data = String.new
    while data.bytesize < n
      begin
        data << $stdin.sysread(n - data.bytesize)
      rescue EOFError
        exit!(0) # the pool let this one go unused
      end
    end
    data
  end
  head = String.new
  head << take.(1) until head.end_with?("\n")
  fields = take.(Integer(head)).force_encoding(Encoding::UTF_8).split("\0", -1)
  file = fields[0]
  cpu, k, m, n = fields[1, 4].map { |f| Integer(f) }
  argv = fields[5, m]
  env = fields[5 + m, n]
  # As the helper sets it for a cold run: SIGXCPU at the limit, SIGKILL a second later.
  Process.setrlimit(Process::RLIMIT_CPU, cpu, cpu + 1)
  # The run's environment, with the same variables in the same order. The sandbox may set
  # PWD as it starts a process (bwrap does, replacing or appending it): do the same.
  pwd = ENV["PWD"]
  ENV.clear
  env.each do |kv|
    name, value = kv.split("=", 2)
    ENV[name] = value
  end
  ENV["PWD"] = pwd if pwd
  locale = Encoding.find("locale")
  ARGV.replace(argv[m - k, k].map { |a| a.dup.force_encoding(locale) })
  $0 = file
  # A script that ends with __END__ has the rest as DATA, as ruby gives it (the line is found
  # as text: an __END__ line inside a heredoc would count here too).
  source = File.binread(file)
  if (at = source =~ /^__END__(\r?\n|\z)/)
    data = File.new(file)
    data.seek(at + $&.bytesize)
    Object.const_set(:DATA, data)
  end
  source = data = at = nil
  begin
    code = RubyVM::InstructionSequence.compile_file(file)
  rescue SyntaxError => e
    # As ruby reports a script that does not parse: the message alone, status 1.
    $stderr.write(e.message.end_with?("\n") ? e.message : e.message + "\n")
    exit!(1)
  end
  begin
    code.eval
  rescue Exception => e
    # Report it as the interpreter would, without this loader's frames.
    bt = e.backtrace
    if bt
      keep = bt.size
      keep -= 1 while keep > 0 && bt[keep - 1].start_with?("-e:")
      e.set_backtrace(bt[0, keep])
    end
    raise e
  end
end.()
